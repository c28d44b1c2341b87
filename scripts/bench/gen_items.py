"""Deterministic order items for the rekey benchmarks.

A line-for-line port of the generator in examples/bench_export.rs (SplitMix64,
same seed, same order of draws), so the local tables loaded here hold
the same items as the exports the example writes. Numbers are Decimal, as
boto3's resource API wants them.

    python gen_items.py N     # prints the first N items as JSON, to compare
"""

import sys
from decimal import Decimal

M64 = 0xFFFFFFFFFFFFFFFF

CLASSES = [("normal", 70, 1), ("large", 20, 5), ("enterprise", 9, 25), ("pathological", 1, 400)]
DAYS = [("2026-07-05", 1), ("2026-07-06", 2), ("2026-07-07", 7)]
STATUSES = ["PLACED", "PAID", "SHIPPED", "DELIVERED", "CANCELLED"]
CURRENCIES = ["USD", "EUR", "GBP"]
STREETS = ["Main", "Oak", "Pine", "Maple", "Cedar", "Elm", "Washington", "Lake"]
CITIES = ["Springfield", "Riverside", "Franklin", "Greenville", "Bristol", "Clinton", "Fairview", "Salem"]


class Rng:
    def __init__(self, seed):
        self.s = seed

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def pick(self, cumulative):
        r = self.next() % cumulative[-1]
        for i, c in enumerate(cumulative):
            if r < c:
                return i
        raise AssertionError


def _cumulative(weights):
    out, acc = [], 0
    for w in weights:
        acc += w
        out.append(acc)
    return out


def items(n):
    """Yields n items (dicts), the same as the Rust example's first n."""
    tenants, weights = [], []
    for name, count, weight in CLASSES:
        for i in range(count):
            tenants.append(f"{name}-{i:02}")
            weights.append(weight)
    tenant_cum = _cumulative(weights)
    day_cum = _cumulative(w for _, w in DAYS)
    r = Rng(0x5EEDBE4C)
    for k in range(n):
        tenant = tenants[r.pick(tenant_cum)]
        day = DAYS[r.pick(day_cum)][0]
        a, b, c, d = r.next(), r.next(), r.next(), r.next()
        order_id = f"{(k * 0x9E3779B97F4A7C15) & M64:016x}"
        ms = a % 86_400_000
        cents = c % 100_000
        yield {
            "PK": f"TENANT#{tenant}#DAY#{day}",
            "SK": f"ORDER#{order_id}",
            "order_id": order_id,
            "customer_id": f"CUST#{b >> 32:08x}",
            "status": STATUSES[b % 5],
            "created_at": f"{day}T{ms // 3_600_000:02}:{ms // 60_000 % 60:02}:{ms // 1000 % 60:02}.{ms % 1000:03}Z",
            "total": Decimal(f"{cents // 100}.{cents % 100:02}"),
            "currency": CURRENCIES[(c >> 32) % 3],
            "line_count": Decimal(1 + d % 9),
            "ship_to": f"{1 + (d >> 8) % 9999} {STREETS[(d >> 24) % 8]} Street, {CITIES[(d >> 32) % 8]}, {(d >> 40) % 100_000:05}",
            "channel": "web" if d >> 63 == 0 else "mobile",
        }


if __name__ == "__main__":
    import json

    for it in items(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        print(json.dumps(it, default=str, sort_keys=True))
