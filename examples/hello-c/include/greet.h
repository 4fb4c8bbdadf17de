#ifndef GREET_H
#define GREET_H
const char *greeting(void);
int answer(void);
#endif
