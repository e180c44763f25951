import random

HEAVY = {"203.0.113.7": 913, "198.51.100.23": 771, "192.0.2.146": 642, "203.0.113.99": 518, "198.51.100.4": 405}

def make_access_log():
    r = random.Random(11)
    ips = [ip for ip, n in HEAVY.items() for _ in range(n)]
    ips += [f"10.{r.randint(0, 3)}.{r.randint(0, 20)}.{r.randint(1, 254)}" for _ in range(16000)]
    r.shuffle(ips)
    paths = ["/", "/login", "/api/v1/items", "/api/v1/items/42", "/static/app.js", "/health"]
    lines = []
    for i, ip in enumerate(ips):
        t = 1709643851 + i * 2
        hh, mm, ss = (t // 3600) % 24, (t // 60) % 60, t % 60
        lines.append(f'{ip} - - [05/Mar/2024:{hh:02d}:{mm:02d}:{ss:02d} +0000] "GET {r.choice(paths)} HTTP/1.1" '
                     f'{r.choice([200, 200, 200, 301, 404, 500])} {r.randint(120, 9000)} "-" "curl/8.{r.randint(0, 9)}"')
    return "\n".join(lines) + "\n"
