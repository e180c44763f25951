#!/bin/bash
set -e
cd /app/wordfreq
python3 - <<'EOF'
src = open("main.go").read()
src = src.replace('\t"strconv"\n', "")
src = src.replace("\ttotal := 0\n", "")
src = src.replace('counts[w] += "1"', "counts[w]++")
src = src.replace("\t\treturn pairs[i].count < pairs[j].count\n",
                  "\t\tif pairs[i].count != pairs[j].count {\n\t\t\treturn pairs[i].count > pairs[j].count\n\t\t}\n\t\treturn pairs[i].word < pairs[j].word\n")
open("main.go", "w").write(src)
EOF
go build -o bin/wordfreq .
echo "b a b c c c" | ./bin/wordfreq
