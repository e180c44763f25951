from .distance import haversine_km, route_length_km

__all__ = ["haversine_km", "route_length_km"]
