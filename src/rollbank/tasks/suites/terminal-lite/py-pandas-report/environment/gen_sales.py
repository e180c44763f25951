import random

r = random.Random(2718)
print("order_id,date,region,status,amount")
for i in range(1, 40001):
    print(f"{i},2024-{r.randint(1, 9):02d}-{r.randint(1, 28):02d},{r.choice(['emea', 'apac', 'amer', 'latam'])},"
          f"{r.choice(['completed', 'completed', 'completed', 'cancelled', 'pending'])},{r.randint(100, 500000) / 100:.2f}")
