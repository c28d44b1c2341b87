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
* TransactWriteItems without moto's deep copy of every table it touches
  (moto's rollback: at 20,000 fleet claims in transactions of 100 the control
  table was copied ~200 times per run and moto grew to 22 GB). For Puts, Deletes and
  ConditionChecks on tables without a stream, every action is checked first
  and the writes follow only if all pass, so nothing is rolled back; any
  other transaction takes moto's own path (see `_transact_write_items_cheap`).

docs/test-backend.md lists every difference found between moto and
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
from moto.dynamodb.comparisons import get_filter_expression
from moto.dynamodb.exceptions import (
    ConditionalCheckFailed,
    InvalidAttributeTypeError,
    MockValidationException,
    MultipleTransactionsException,
    TransactionCanceledException,
)
from moto.dynamodb.models import DynamoDBBackend
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.dynamodb.models.dynamo_type import DynamoType, Item
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


_transact_write_items = DynamoDBBackend.transact_write_items

# The actions whose outcome can be known before anything is written: an
# Update's depends on moto's update executor, left to moto's own path.
_CHECKED_FIRST = ("Put", "Delete", "ConditionCheck")


class _Sequential(Exception):
    """The transaction needs moto's own path, which applies its actions one
    after another: two of them name one stored item in different texts
    (`{"N": "1"}` and `{"N": "1.0"}`), which moto's check of one action per
    item (by the key's text) lets through."""


def _transact_write_items_cheap(self, transact_items):
    """moto's `transact_write_items` with a cheap rollback.

    moto applies each action in turn and, to undo them when one fails,
    deep-copies every table the transaction touches first: the copy is the
    cost of the call, growing with the table (moto reached 22 GB under the
    fleet's claims, BENCHMARKS.md (h2)). A transaction touches an item once
    at most (DynamoDB refuses one that names an item twice, and so does
    moto), so each action's outcome depends on its own item alone, as it
    was before the transaction: everything is checked first, in moto's
    order and with moto's errors (`_checked`), and the writes follow only
    when every check passed. A refused transaction writes nothing, so
    there is nothing to roll back. Transactions with an Update, on a table
    with a stream (whose records a rollback would have to take back), or of
    a shape moto answers in its own way (more than 100 actions, two
    operations in one action, a table named by its ARN or missing) take
    moto's own path."""
    if not _checked_first(self, transact_items):
        return _transact_write_items(self, transact_items)
    try:
        writes, errors = _checked(self, transact_items)
    except _Sequential:
        return _transact_write_items(self, transact_items)
    if any(code is not None for code, _, _ in errors):
        raise TransactionCanceledException(errors)
    if not _applied(self, writes):
        # A write failed that its check let through: nothing of it is left,
        # and moto's own path gives moto's answer.
        return _transact_write_items(self, transact_items)


def _checked_first(backend, transact_items):
    """Whether `_transact_write_items_cheap` answers the transaction itself."""
    if len(transact_items) > 100:
        return False
    for action in transact_items:
        if not isinstance(action, dict) or len(action) != 1:
            return False
        ((kind, op),) = action.items()
        if kind not in _CHECKED_FIRST or not isinstance(op, dict):
            return False
        name = op.get("TableName")
        table = backend.tables.get(name) if isinstance(name, str) else None
        if table is None or _has_stream(table):
            return False
    return True


def _has_stream(table):
    spec = table.stream_specification or {}
    return table.stream_shard is not None or bool(spec.get("StreamEnabled"))


def _checked(backend, transact_items):
    """moto's loop over the actions up to each one's write, with its errors:
    the writes to make, and one (code, message, item) per action, (None,
    None, None) for one that passed. Raises what moto raises mid-loop (two
    actions on one item, a validation error)."""
    seen_texts = set()  # moto's check, by the key's text
    seen_items = set()  # the stored item each action names
    writes, errors = [], []
    for action in transact_items:
        ((kind, op),) = action.items()
        original_item = None
        try:
            table_name = op["TableName"]
            condition_expression = op.get("ConditionExpression")
            expression_attribute_names = op.get("ExpressionAttributeNames")
            expression_attribute_values = op.get("ExpressionAttributeValues")
            return_values_on_condition_check_failure = op.get(
                "ReturnValuesOnConditionCheckFailure"
            )
            table = backend.get_table(table_name)
            if kind == "Put":
                attrs = op["Item"]
                key = {table.hash_key_attr: attrs[table.hash_key_attr]}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = attrs[table.range_key_attr]
            else:
                key = op["Key"]

            text = (str(table_name), str(dict(sorted(key.items()))))
            if text in seen_texts:
                raise MultipleTransactionsException()
            seen_texts.add(text)

            current = backend.get_item(table_name, key)
            stored = (table_name,) + backend.get_keys_value(table, key)
            if stored in seen_items:
                raise _Sequential()
            seen_items.add(stored)

            if condition_expression is not None:
                condition_op = get_filter_expression(
                    condition_expression,
                    expression_attribute_names,
                    expression_attribute_values,
                )
                if not condition_op.expr(current):
                    if (
                        return_values_on_condition_check_failure == "ALL_OLD"
                        and current
                    ):
                        original_item = current.to_json()["Attributes"]
                    raise ConditionalCheckFailed(item=original_item)

            if kind == "Put":
                _refuse_put(table, attrs)
            if kind != "ConditionCheck":
                writes.append((kind, op, table, key))
            errors.append((None, None, None))
        except (MultipleTransactionsException, MockValidationException, _Sequential):
            raise
        except ConditionalCheckFailed as e:
            errors.append(("ConditionalCheckFailed", str(e.message), original_item))
        except Exception as e:
            errors.append((type(e).__name__, str(e), original_item))
    return writes, errors


def _refuse_put(table, attrs):
    """Raises what moto's `Table.put_item` raises for `attrs` before it
    writes (its checks of the item alone, in its order): moto's
    transaction meets these only when it writes, after the check of the
    condition."""
    hash_value = DynamoType(attrs[table.hash_key_attr])
    range_value = None
    if table.range_key_attr is not None:
        range_value = DynamoType(attrs[table.range_key_attr])
    if hash_value.type != table.hash_key_type:
        raise InvalidAttributeTypeError(
            table.hash_key_attr,
            expected_type=table.hash_key_type,
            actual_type=hash_value.type,
        )
    if range_value and range_value.type != table.range_key_type:
        raise InvalidAttributeTypeError(
            table.range_key_attr,
            expected_type=table.range_key_type,
            actual_type=range_value.type,
        )
    table._validate_item_types(attrs)
    table._validate_key_sizes(attrs)
    Item(hash_value, range_value, attrs)  # over 400 KB: ItemSizeTooLarge


def _applied(backend, writes):
    """Makes the checked writes with moto's own calls (as its transaction
    does). Should one fail all the same, the items written are put back as
    they were (an item is replaced on write, never changed in place, so
    the old object is the old item) and the answer is False."""
    undo = []
    try:
        for kind, op, table, key in writes:
            hash_key, range_key = backend.get_keys_value(table, key)
            before = table.get_item(hash_key, range_key)
            undo.append((table, hash_key, range_key, before))
            kwargs = dict(
                condition_expression=op.get("ConditionExpression"),
                expression_attribute_names=op.get("ExpressionAttributeNames"),
                expression_attribute_values=op.get("ExpressionAttributeValues"),
            )
            if kind == "Put":
                backend.put_item(op["TableName"], op["Item"], **kwargs)
            else:
                backend.delete_item(op["TableName"], key, **kwargs)
    except Exception:
        for table, hash_key, range_key, before in reversed(undo):
            _put_back(table, hash_key, range_key, before)
        return False
    return True


def _put_back(table, hash_key, range_key, before):
    if range_key is not None:
        if before is None:
            table.items[hash_key].pop(range_key, None)
        else:
            table.items[hash_key][range_key] = before
    elif before is None:
        table.items.pop(hash_key, None)
    else:
        table.items[hash_key] = before


Table.all_items = _all_items
DynamoDBBackend.transact_write_items = _transact_write_items_cheap
ResponseSerializer.get_value = _picked_value
DomainDispatcherApplication.get_backend_for_host = _backend_for_host_cached
StreamShard.add = _add_if_changed
DynamoDBBackend.update_item = _update_item_one_record
server.run_simple = _run_simple_serialized
logging.getLogger("werkzeug").setLevel(logging.WARNING)
print("rekey: moto", __import__("importlib.metadata").metadata.version("moto"), flush=True)
server.main(sys.argv[1:])
