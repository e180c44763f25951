import json, random

def make_orders():
    r = random.Random(31)
    names = [("Acme GmbH", "DE"), ("Borealis, Inc.", "US"), ("Cobalt SA", "FR"), ("Dune Ltd", "GB")]
    orders = []
    for oid in r.sample(range(1000, 9999), 60):
        name, country = r.choice(names)
        items = [{"sku": f"SKU-{r.randint(1, 50):03d}", "qty": r.randint(1, 5),
                  "price": r.randint(99, 25000) / 100} for _ in range(r.randint(1, 4))]
        orders.append({"id": oid, "customer": {"name": name, "country": country}, "items": items})
    return json.dumps(orders)
