import random, sys
r = random.Random(8675309)
pool = [r.randint(1, 999_999_999) for _ in range(1_600_000)]
with open(sys.argv[1], "w") as f:
    f.write("\n".join(str(r.choice(pool)) for _ in range(4_000_000)) + "\n")
