#include <ctype.h>
#include <string.h>
#include "util.h"

int count_words(const char *s) {
    int n = 0, in = 0;
    for (; *s; s++) {
        if (isspace((unsigned char)*s)) in = 0;
        else if (!in) { in = 1; n++; }
    }
    return n;
}

size_t count_chars(const char *s) { return strlen(s); }
