import db

rows = db.fetch_rows_v1("x")  # fetch_rows_v1 is the loader
