import json, random

def make_users():
    r = random.Random(5)
    first = ["ana", "bo", "cy", "dee", "eli", "fay", "gus", "hal", "ivy", "jo", "kai", "lu"]
    users = []
    for i in range(1, 121):
        n = f"{r.choice(first)}{i}"
        users.append({"id": i, "name": n, "email": f"{n}@example.{r.choice(['org', 'com', 'net'])}",
                      "active": r.random() < 0.6, "age": r.randint(18, 70),
                      "tags": r.sample(["admin", "beta", "ops", "dev"], r.randint(0, 2))})
    return json.dumps({"generated": "fixture", "users": users}, indent=2)
