def merge(intervals):
    """Merge overlapping or touching closed intervals; return sorted list of tuples."""
    out = []
    for start, end in intervals:
        if out and start < out[-1][1]:
            out[-1][1] = end
        else:
            out.append([start, end])
    return out
