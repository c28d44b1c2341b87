"""rekey read path: reference implementation (Python 3).

Spec: docs/read-path.md. Read one logical key spread over several partition
keys as one stream in sort-key order, a page at a time, with rekey's cursor.
`query` is your Query call (see query_fn in docs/read-path.md).
"""

import base64
import json

VERSION = 1


class CursorError(ValueError):
    """kind: "malformed", "version", "foreign" or "out_of_range"."""

    def __init__(self, kind):
        super().__init__(f"bad cursor: {kind}")
        self.kind = kind


def _json(value):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def query_id(q):
    """FNV-1a 64 of the query's canonical JSON, 16 hex digits."""
    c = q["condition"]
    parts = ["rekey-query/1", q["table"], q["partition_key"], q["sort_key"], q["rule"],
             q["order"], c["kind"], c.get("a", ""), c.get("b", "")] + list(q["keys"])
    h = 0xCBF29CE484222325
    for b in _json(parts).encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def encode_cursor(qid, key, sk):
    text = '{"v":%d,"q":%s,"k":%d,"s":%s}' % (VERSION, _json(qid), key, _json(sk))
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


# Python compares str by code point, which is UTF-8 byte order: DynamoDB's order.
def _range(cond):
    """[lower, upper, prefix]; a bound is (value, inclusive)."""
    kind = cond["kind"]
    if kind == "begins_with":
        return [None, None, cond["a"]]
    if kind == "between":
        return [(cond["a"], True), (cond["b"], True), None]
    return [None, None, None]


def _contains(r, sk):
    lower, upper, prefix = r
    return ((lower is None or sk > lower[0] or (lower[1] and sk == lower[0]))
            and (upper is None or sk < upper[0] or (upper[1] and sk == upper[0]))
            and (prefix is None or sk.startswith(prefix)))


def _past_end(r, sk, asc):
    lower, upper, prefix = r
    if asc:
        past = upper is not None and (sk > upper[0] or (not upper[1] and sk == upper[0]))
        return past or (prefix is not None and not sk.startswith(prefix) and sk > prefix)
    past = lower is not None and (sk < lower[0] or (not lower[1] and sk == lower[0]))
    return past or (prefix is not None and not sk.startswith(prefix) and sk < prefix)


def _key_condition(r):
    """The one DynamoDB sort-key condition: {"op": None|"begins_with"|"between"|">"|">="|"<"|"<=", "values": [...]}."""
    lower, upper, prefix = r
    if lower and upper:
        return {"op": "between", "values": [lower[0], upper[0]]}
    if lower:
        return {"op": ">=" if lower[1] else ">", "values": [lower[0]]}
    if upper:
        return {"op": "<=" if upper[1] else "<", "values": [upper[0]]}
    if prefix is not None:
        return {"op": "begins_with", "values": [prefix]}
    return {"op": None, "values": []}


def decode_cursor(text, q, qid=None):
    """The (key index, sort key) of a cursor of query q, or CursorError."""
    text = text.strip()
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        if base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") != text:
            raise ValueError("not canonical base64url")
        c = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise CursorError("malformed") from None
    if not isinstance(c, dict):
        raise CursorError("malformed")
    v = c.get("v")
    if type(v) is not int or v < 0:
        raise CursorError("malformed")
    if v != VERSION:
        raise CursorError("version")
    if (set(c) != {"v", "q", "k", "s"} or not isinstance(c["q"], str)
            or type(c["k"]) is not int or c["k"] < 0 or not isinstance(c["s"], str)):
        raise CursorError("malformed")
    if c["q"] != (qid or query_id(q)):
        raise CursorError("foreign")
    if c["k"] >= len(q["keys"]) or not _contains(_range(q["condition"]), c["s"]):
        raise CursorError("out_of_range")
    return c["k"], c["s"]


def read_page(q, cursor, query):
    """One page: {"items": [(key index, sort key, item)], "cursor": text or None}.

    query(request) -> (items, last_evaluated_key); request has "key" (the
    partition key value), "condition" (see _key_condition), "ascending",
    "exclusive_start_key" (None or the last call's last_evaluated_key) and
    "limit"; items are (sort key, item) pairs in the read's order.
    """
    qid = query_id(q)
    asc = q["order"] == "asc"
    limit = max(1, q["limit"])
    after = decode_cursor(cursor, q, qid) if cursor else None
    fetched = []
    for i, key in enumerate(q["keys"]):
        r = _range(q["condition"])
        if after:
            bound = (after[1], i > after[0])  # keys after the cursor's own: from its sort key on
            if asc:
                r[0] = bound
            else:
                r[1] = bound
        start, got = None, []
        while len(got) < limit + 1:
            items, lek = query({"key": key, "condition": _key_condition(r), "ascending": asc,
                                "exclusive_start_key": start, "limit": limit + 1 - len(got)})
            done = lek is None
            for sk, item in items:
                if _contains(r, sk):
                    got.append((i, sk, item))
                elif _past_end(r, sk, asc):
                    done = True
                    break
            if done:
                break
            start = lek
        fetched.extend(got[: limit + 1])
    # Merge order: sort key in the read's order, then key index.
    fetched.sort(key=lambda e: e[0])
    fetched.sort(key=lambda e: e[1], reverse=not asc)
    page = fetched[:limit]
    more = len(fetched) > limit
    return {"items": page, "cursor": encode_cursor(qid, page[-1][0], page[-1][1]) if more else None}
