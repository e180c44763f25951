from db import fetch_rows_v1


def h(q):
    return fetch_rows_v1(q) + prefetch_rows_v1(q)


def prefetch_rows_v1(q):
    return []
