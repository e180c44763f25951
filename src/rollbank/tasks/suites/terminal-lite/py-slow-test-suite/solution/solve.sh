#!/bin/bash
set -e
cat > /app/geo/distance.py <<'EOF'
import math

EARTH_RADIUS_KM = 6371.0088


def haversine_km(a, b):
    """Great-circle distance between points a=(lat, lon) and b=(lat, lon) in degrees."""
    lat1, lon1 = map(math.radians, a)
    lat2, lon2 = map(math.radians, b)
    dlat = lat2 - lat1
    dlon = lon2 - lon1
    h = math.sin(dlat / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin(dlon / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(h))


def route_length_km(points):
    """Total length of the polyline through points, in km."""
    total = 0.0
    for i in range(len(points) - 1):
        total += haversine_km(points[i], points[i + 1])
    return total
EOF
cd /app && pytest -q -p no:cacheprovider tests
