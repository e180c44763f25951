#!/bin/bash
set -e
sed -i -e 's/^port = .*/port = 8081/' -e 's/^debug = .*/debug = true/' /app/app.conf
