#include "greet.h"

const char *greeting(void) { return "hello from drover"; }
