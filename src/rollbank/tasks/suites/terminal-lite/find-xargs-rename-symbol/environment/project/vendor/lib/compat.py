def fetch_rows_v1():
    pass
