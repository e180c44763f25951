import random, sys
r = random.Random(31337)
hosts = [f"node-{i:03d}" for i in range(64)]
with open(sys.argv[1], "w") as f:
    f.write("ts,host,cpu_pct,mem_mb,gpu_util,queue_depth\n")
    t = 1709596800
    for i in range(160000):
        t += r.randint(0, 2)
        f.write(f"{t},{r.choice(hosts)},{r.random() * 100:.1f},{r.randint(200, 16000)},{r.randint(0, 100)},{r.randint(0, 40)}\n")
