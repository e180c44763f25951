#!/bin/sh
echo "run ok: $(( 6 * 7 ))"
