#ifndef UTIL_H
#define UTIL_H
#include <stddef.h>
int count_words(const char *s);
size_t count_chars(const char *s);
#endif
