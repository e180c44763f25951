#include <stdio.h>
#include "util.h"

int main(void) {
    char buf[4096];
    long lines = 0, words = 0, chars = 0;
    while (fgets(buf, sizeof buf, stdin)) {
        lines++;
        words += count_words(buf);
        chars += (long)count_chars(buf);
    }
    printf("%ld %ld %ld\n", lines, words, chars);
    return 0;
}
