#!/bin/bash
set -e
cat > /app/Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall -Iinclude

OBJS = build/main.o build/util.o

bin/wordstat: $(OBJS)
	mkdir -p bin
	$(CC) $(CFLAGS) -o $@ $(OBJS)

build/%.o: src/%.c include/util.h
	mkdir -p build
	$(CC) $(CFLAGS) -c $< -o $@

clean:
	rm -rf build bin

.PHONY: clean
EOF
make -C /app
