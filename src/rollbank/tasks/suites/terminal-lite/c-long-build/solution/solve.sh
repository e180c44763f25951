#!/bin/bash
set -e
cd /app/engine
sed -i 's#^SRCS := .*#SRCS := $(wildcard src/*.c) $(wildcard src/mods/*.c)#' Makefile
make -s
./bin/engine > /app/engine_output.txt
