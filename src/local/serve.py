"""moto's server, one request at a time.

rekey starts this with the interpreter of the `moto_server` it found:
`python -c <this file> -H 127.0.0.1 -p PORT`. It is moto's own `main`
(moto.server) with two changes:

* Every request is handled under one lock. moto answers on parallel threads
  and keeps no lock of its own around a DynamoDB operation, so a conditional
  write's check and its write, or a write and the stream record it appends,
  can interleave with another request: two records get the same sequence
  number, or a stream holds an item's writes out of order. DynamoDB applies
  each write to an item atomically and records it in order; rekey's tail and
  its in-place writes rely on that. moto runs Python under one interpreter
  lock anyway, so little throughput is lost.
* Its DynamoDB stream records what DynamoDB records, no more: a write that
  changes nothing gets no record (moto writes a MODIFY with equal images), and
  an UpdateItem that creates an item gets one INSERT (moto first puts the key
  alone and records that too, an image no application wrote).
* werkzeug's line per request is not logged (errors still are): thousands of
  lines a second would cost the parent CPU to read.
* A faster path through moto's response serializer, with the same output:
  half of moto's CPU went to looking up each attribute of a response through
  six alias providers (`AttributePicker`), although a response built from
  plain dicts holds its members under their own names. For a plain dict that
  holds the key, and no alias tried before the key's own name is present,
  the upstream lookup returns `obj[key]`; so does this (see
  `_picked_value`). Everything else takes moto's own path.
* Scan sorts the table by key values computed once per item (moto computed
  them again in every comparison: a third of a Scan's time). The order is
  moto's: its key comparisons are those of the same values.
* The backend a Host header names is remembered: moto searched its list of
  modules and URL patterns again for every request (a fifth of its CPU).

ARCHITECTURE.md ("Test backend") lists every difference found between moto and
DynamoDB and what covers it.
"""

import copy
import logging
import sys
import threading

import moto.server as server
from botocore import xform_name
from moto.core.serialize import (
    DEFAULT_ALIAS_PROVIDERS,
    ResponseSerializer,
    XFormedAttributePicker,
)
from moto.dynamodb.models import DynamoDBBackend
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import StreamShard, Table

_run_simple = server.run_simple
_lock = threading.Lock()


def _one_at_a_time(app):
    def handle(environ, start_response):
        with _lock:
            # The whole body is produced under the lock.
            return list(app(environ, start_response))

    return handle


def _run_simple_serialized(host, port, app, **kwargs):
    return _run_simple(host, port, _one_at_a_time(app), **kwargs)


_add = StreamShard.add


def _add_if_changed(self, old, new):
    if old is not None and new is not None and old.to_json() == new.to_json():
        return
    _add(self, old, new)


_update_item = DynamoDBBackend.update_item


def _update_item_one_record(self, table_name, key, *args, **kwargs):
    """moto's update_item with the table's stream detached, then one record
    from the item before to the item after."""
    try:
        table = self.get_table(table_name)
        shard = table.stream_shard
        hash_key = DynamoType(key[table.hash_key_attr])
        range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
        before = copy.deepcopy(table.get_item(hash_key, range_key))
    except Exception:
        # A bad request: moto's own call raises the right error for it.
        return _update_item(self, table_name, key, *args, **kwargs)
    if shard is None:
        return _update_item(self, table_name, key, *args, **kwargs)
    table.stream_shard = None
    try:
        item = _update_item(self, table_name, key, *args, **kwargs)
    finally:
        table.stream_shard = shard
    shard.add(before, item)
    return item


_get_value = ResponseSerializer.get_value


def _picked_value(self, value, key, shape):
    """`ResponseSerializer.get_value` for a plain dict, when the answer is
    `value[key]`: the default picker (XFormedAttributePicker, default alias
    providers, no transformers) tries, in order, an alias from the object's
    `Meta` (a dict has none), the shape's name and its snake_case form (lists
    and structures only), then the key itself, and takes the first present."""
    picker = self._value_picker
    if (
        type(value) is dict
        and type(picker) is XFormedAttributePicker
        and picker.alias_providers is DEFAULT_ALIAS_PROVIDERS
        and not picker.response_transformers
        and isinstance(key, str)
        and "." not in key
        and key in value
        and (
            shape is None
            or shape.type_name not in ("list", "structure")
            or (shape.name not in value and xform_name(shape.name) not in value)
        )
    ):
        return value[key]
    return _get_value(self, value, key, shape)


_backend_for_host = DomainDispatcherApplication.get_backend_for_host
_backends = {}


def _backend_for_host_cached(self, host):
    """moto's lookup is a function of the host alone (fixed module list and
    URL patterns); found backends are remembered, misses asked again."""
    if host in _backends:
        return _backends[host]
    backend = _backend_for_host(self, host)
    if backend:
        _backends[host] = backend
    return backend


def _all_items(self):
    """`Table.all_items`, sorted by each key's `cast_value` once: moto's sort
    key is the `DynamoType`s, whose `<` and `==` compare their `cast_value`s
    (and types, which are one per key attribute)."""
    items = []
    for hash_set in self.items.values():
        if self.range_key_attr:
            items.extend(hash_set.values())
        else:
            items.append(hash_set)
    return sorted(
        items,
        key=lambda x: (x.hash_key.cast_value, x.range_key.cast_value)
        if x.range_key
        else x.hash_key.cast_value,
    )


Table.all_items = _all_items
ResponseSerializer.get_value = _picked_value
DomainDispatcherApplication.get_backend_for_host = _backend_for_host_cached
StreamShard.add = _add_if_changed
DynamoDBBackend.update_item = _update_item_one_record
server.run_simple = _run_simple_serialized
logging.getLogger("werkzeug").setLevel(logging.WARNING)
print("rekey: moto", __import__("importlib.metadata").metadata.version("moto"), flush=True)
server.main(sys.argv[1:])
