import hashlib

def test_unique_sorted():
    h = hashlib.sha256()
    n = 0
    with open("/app/unique_ids.txt", "rb") as f:
        for line in f:
            h.update(line.strip() + b"\n")
            n += 1
    assert n == 1467497
    assert h.hexdigest() == "ef51d0c636c2b9272bae768135629945b7e7c58b4bf02ce9cec688df2b4039bc"
