def fetch_rows_v1(q):
    return []


def fetch_rows_v10(q):
    return [q]
