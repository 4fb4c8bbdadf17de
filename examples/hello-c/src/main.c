#include <stdio.h>
#include "greet.h"

int main(void) {
    printf("%s: the answer is %d\n", greeting(), answer());
    return 0;
}
