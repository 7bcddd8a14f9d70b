# repair/model/mr_mirror: MR mirrors on every NIC and the peers' rkey maps (key
# translation for hot repair; on with R2CC_MR_MIRROR=1). Included from
# repair/module.mk.

MIRROR_SRCS := repair/model/mr_mirror.c
MIRROR_HDRS := repair/model/mr_mirror.h
LIBR2CC_SRCS += $(MIRROR_SRCS)

# Unit tests: the wire format, the service's answers to malformed requests,
# the cache, and the mirror bookkeeping over test doubles of the verbs.
MIRROR_UNIT := $(BUILD)/tests/unit/test_mr_mirror
MIRROR_UNIT_SRCS := $(MIRROR_SRCS) $(CTL_SRCS) shim/params.c shim/failspec.c shim/drillspec.c shim/log.c shim/cost_params.c \
		    shim/map.c shim/registry.c shim/stats.c shim/comm.c shim/core.c shim/report.c shim/protect.c shim/fault.c

$(MIRROR_UNIT): tests/unit/test_mr_mirror.c $(MIRROR_UNIT_SRCS) $(MIRROR_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -DR2CC_VERSION_STRING='"test"' -o $@ $< $(MIRROR_UNIT_SRCS) -lcriterion -lcrypto -ldl \
		-Wl,--wrap=pthread_mutex_lock

# End to end over the software RDMA device: two processes forming a job
# through the NCCL test double, under a test copy of libr2cc.so (the same
# objects plus tests/mirror/door.c, which exports the mirror's functions).
MIRROR_DOOR := $(BUILD)/tests/mirror/libr2cc-door.so
MIRROR_E2E := $(BUILD)/tests/mirror/mirror_e2e

$(BUILD)/obj/tests/mirror/door.o: tests/mirror/door.c tests/mirror/door.h $(MIRROR_HDRS)
	@mkdir -p $(@D)
	$(CC) $(LIB_CFLAGS) -c -o $@ $<

$(MIRROR_DOOR): $(LIBR2CC) $(BUILD)/obj/tests/mirror/door.o tests/mirror/door.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $(LIBR2CC_OBJS) $(BUILD)/obj/tests/mirror/door.o \
		-Wl,--version-script=tests/mirror/door.map -Wl,-z,defs $(LIBR2CC_LIBS)

$(MIRROR_E2E): tests/mirror/mirror_e2e.c tools/drill/verbs.c tools/drill/drill.h
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< tools/drill/verbs.c -ldl

TEST_DEPS += $(MIRROR_UNIT) $(MIRROR_DOOR) $(MIRROR_E2E) $(BUILD)/bin/r2cc-verbs-drill
CPU_TESTS += 60@$(MIRROR_UNIT):--jobs=2 120@tests/mirror/run.sh
FORMAT_SRCS += $(MIRROR_SRCS) $(MIRROR_HDRS) tests/unit/test_mr_mirror.c tests/mirror/door.c tests/mirror/door.h \
	       tests/mirror/mirror_e2e.c
