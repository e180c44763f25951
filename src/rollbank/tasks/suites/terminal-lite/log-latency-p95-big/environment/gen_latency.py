import random, sys

def main(path):
    r = random.Random(20240305)
    eps = [("/api/v1/rollouts", 35, 0.7), ("/api/v1/groups", 60, 0.5), ("/api/v1/batches", 140, 0.9),
           ("/api/v1/models", 20, 0.3), ("/healthz", 2, 0.2), ("/api/v1/sandboxes/fork", 90, 1.1),
           ("/api/v1/verify", 250, 0.8), ("/metrics", 8, 0.4)]
    weights = [30, 20, 8, 6, 25, 5, 4, 10]
    methods = {"/api/v1/rollouts": "POST", "/api/v1/sandboxes/fork": "POST", "/api/v1/verify": "POST"}
    t = 1709596800
    with open(path, "w") as f:
        for i in range(520000):
            ep, base, sigma = r.choices(eps, weights=weights)[0]
            ms = int(base * r.lognormvariate(0, sigma)) + 1
            t += r.randint(0, 1)
            status = 200 if r.random() > 0.02 else r.choice([500, 502, 429])
            f.write(f"ts={t} method={methods.get(ep, 'GET')} path={ep} status={status} duration_ms={ms} req_id={r.getrandbits(48):012x}\n")

if __name__ == "__main__":
    main(sys.argv[1])
