"""Reference stream consumer: the re-keying replay written the way AWS's
documentation examples read a DynamoDB Stream, to compare `rekey tail` with.

DescribeStream for the shards, GetShardIterator (TRIM_HORIZON, or LATEST),
then a GetRecords loop over the shards' iterators with a short sleep when a
pass returned nothing; each record is deserialized (boto3's TypeDeserializer),
given the same key change as plans/tenant-day-shard.toml (reference_copier.rekey)
and written to the target one at a time: put_item for INSERT/MODIFY,
delete_item for REMOVE (and for the old key when a MODIFY changes the target key).

No checkpoints, no lineage order beyond "a closed shard's children are found by
describing the stream again", no retries beyond botocore's own: the simplest
thing that works.

    python reference_tail.py SOURCE TARGET [--poll 0.25] [--iterator TRIM_HORIZON|LATEST]

--poll defaults to 0.25 s, the same as rekey tail's (fixed) poll interval, so
the comparison is of the rest of the pipeline. Runs until SIGTERM/SIGINT, then
prints one JSON line: {"records", "puts", "deletes", "skipped", "seconds"}.
"""

import argparse
import json
import os
import signal
import sys
import time

import boto3
from boto3.dynamodb.types import TypeDeserializer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_copier import rekey  # noqa: E402  (the same key change)

stop = False


def on_signal(signum, frame):
    global stop
    stop = True


def shards_of(streams, arn):
    shards, start = [], None
    while True:
        kw = {"StreamArn": arn, **({"ExclusiveStartShardId": start} if start else {})}
        desc = streams.describe_stream(**kw)["StreamDescription"]
        shards += desc["Shards"]
        start = desc.get("LastEvaluatedShardId")
        if not start:
            return shards


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("target")
    ap.add_argument("--poll", type=float, default=0.25, help="sleep when a pass over the shards returned nothing (s)")
    ap.add_argument("--iterator", choices=["TRIM_HORIZON", "LATEST"], default="TRIM_HORIZON")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    session = boto3.session.Session()
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    ddb = session.resource("dynamodb", endpoint_url=endpoint)
    streams = session.client("dynamodbstreams", endpoint_url=endpoint)
    target = ddb.Table(a.target)
    arn = ddb.meta.client.describe_table(TableName=a.source)["Table"]["LatestStreamArn"]
    des = TypeDeserializer()

    def image(m):
        return {k: des.deserialize(v) for k, v in m.items()}

    counts = {"records": 0, "puts": 0, "deletes": 0, "skipped": 0}
    iterators, done = {}, set()

    def refresh(kind):
        for s in shards_of(streams, arn):
            sid = s["ShardId"]
            if sid in iterators or sid in done:
                continue
            it = streams.get_shard_iterator(StreamArn=arn, ShardId=sid, ShardIteratorType=kind)
            iterators[sid] = it["ShardIterator"]

    started = time.monotonic()
    refresh(a.iterator)
    while not stop:
        got = 0
        for sid in list(iterators):
            out = streams.get_records(ShardIterator=iterators[sid], Limit=1000)
            for r in out["Records"]:
                d = r["dynamodb"]
                old = rekey(image(d["OldImage"])) if "OldImage" in d else None
                new = rekey(image(d["NewImage"])) if "NewImage" in d else None
                counts["records"] += 1
                if r["eventName"] == "REMOVE" or new is None:
                    if old is not None:
                        target.delete_item(Key={"PK": old["PK"], "SK": old["SK"]})
                        counts["deletes"] += 1
                    else:
                        counts["skipped"] += 1
                    continue
                if old is not None and (old["PK"], old["SK"]) != (new["PK"], new["SK"]):
                    target.delete_item(Key={"PK": old["PK"], "SK": old["SK"]})
                    counts["deletes"] += 1
                target.put_item(Item=new)
                counts["puts"] += 1
            got += len(out["Records"])
            if out.get("NextShardIterator"):
                iterators[sid] = out["NextShardIterator"]
            else:  # closed and read to its end: its children appear in DescribeStream
                del iterators[sid]
                done.add(sid)
                refresh("TRIM_HORIZON")  # a new shard: all of it
        if not got:
            time.sleep(a.poll)
    counts["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
