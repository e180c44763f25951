class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.keys = []
        self.data = {}
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        if key in self.data:
            self.hits += 1
            return self.data[key]
        return default

    def put(self, key, value):
        self.keys.append(key)
        self.data[key] = value
        if len(self.keys) > self.capacity:
            old = self.keys.pop()
            del self.data[old]

    def __len__(self):
        return len(self.keys)
