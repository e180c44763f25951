import csv, io, random

def make_sales():
    r = random.Random(99)
    cats = ["Books, Used", "Books", "Garden", "Toys", "Kitchen", "Audio \"Pro\""]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["id", "date", "category", "amount", "region"])
    for i in range(1, 2501):
        w.writerow([i, f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}", r.choice(cats),
                    f"{r.randint(100, 99999) / 100:.2f}", r.choice(["north", "south", "east", "west"])])
    return buf.getvalue()
