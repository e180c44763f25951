print("fetch_rows_v1")
from db import fetch_rows_v1 as f
