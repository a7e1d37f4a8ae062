/*
 * ferry-worker - the worker program, local or remote. All of it is
 * ferry_worker_main() (core/worker_main.c), which other programs embed too.
 */
#include "ferry_dataset.h"

int main(int argc, char **argv)
{
    return ferry_worker_main(argc, argv, "ferry-worker", NULL);
}
