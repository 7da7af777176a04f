/*
 * What the C tests share: opening an engine on a transport (with one more option when
 * given), and stopping on a failed setup step with its status and message. The examples
 * do not use it: each stays whole, to be copied.
 */
#ifndef HMC_TESTS_COMMON_H
#define HMC_TESTS_COMMON_H

#include <hmc/hmc.h>

#include <stdio.h>
#include <stdlib.h>

/* Exits when `s` is not HMC_OK, naming the step. */
static inline void test_check(hmc_status s, const char *what) {
    if (s != HMC_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, hmc_status_name(s), hmc_last_error());
        exit(1);
    }
}

/* An engine at `local` over `transport`, with the option `key`=`value` when `key` is not
 * NULL. */
static inline hmc_engine *test_open(const char *local, const char *transport, const char *key,
                                    const char *value) {
    hmc_option opts[] = {{"transport", transport}, {key, value}};
    hmc_engine_options o = HMC_ENGINE_OPTIONS_INIT;
    o.options = opts;
    o.num_options = key != NULL ? 2 : 1;
    hmc_engine *e = NULL;
    test_check(hmc_engine_open(local, &o, &e), "hmc_engine_open");
    return e;
}

#endif /* HMC_TESTS_COMMON_H */
