from gitlib import *
init()
commit("Add parser", parser_DOT_py="STRICT = False\n\n\ndef parse(s):\n    return [x.strip() for x in s.split(',') if x.strip() or STRICT]\n")
commit("Add cli", cli_DOT_py="import parser\nprint(parser.parse('a, b,,c'))\n")
commit("Switch parser to strict mode", parser_DOT_py="STRICT = True\n\n\ndef parse(s):\n    return [x.strip() for x in s.split(',') if x.strip() or STRICT]\n")
commit("Add docs", docs_DOT_md="Parser splits on commas.\n")
commit("Cli prints count", cli_DOT_py="import parser\nr = parser.parse('a, b,,c')\nprint(len(r), r)\n")
