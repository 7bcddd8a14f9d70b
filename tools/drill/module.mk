# tools/drill: r2cc-verbs-drill, NCCL-shaped verbs traffic over the software RDMA device
# with NIC faults (see tools/drill/README.md). It loads libibverbs with dlopen/dlvsym as
# NCCL does, so it must not link it.

DRILL_DIR  := tools/drill
DRILL      := $(BUILD)/bin/r2cc-verbs-drill
DRILL_OBJ  := $(BUILD)/drill/obj
DRILL_SRCS := $(DRILL_DIR)/main.c $(DRILL_DIR)/parse.c $(DRILL_DIR)/proc.c \
	      $(DRILL_DIR)/fault.c $(DRILL_DIR)/reports.c $(DRILL_DIR)/scenario.c \
	      $(DRILL_DIR)/worker.c $(DRILL_DIR)/verbs.c $(DRILL_DIR)/pattern.c \
	      $(DRILL_DIR)/bootstrap.c $(DRILL_DIR)/nccl_version.c
DRILL_OBJS := $(DRILL_SRCS:$(DRILL_DIR)/%.c=$(DRILL_OBJ)/%.o)
# What a run needs besides the program: the device, its control tool and the library.
DRILL_RUNTIME := $(BUILD)/softverbs/libibverbs.so.1 $(BUILD)/softverbs/libibverbs.so \
		 $(BUILD)/softverbs/mlx5/libmlx5.so.1 \
		 $(BUILD)/bin/softverbs-ctl $(LIBR2CC) $(BUILD)/tests/ncclstub/libnccl.so.2

$(DRILL_OBJ)/%.o: $(DRILL_DIR)/%.c
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -MMD -MP -c -o $@ $<

$(DRILL): $(DRILL_OBJS)
	@mkdir -p $(@D)
	$(CC) -o $@ $(DRILL_OBJS) -ldl -lm -pthread -Wl,--export-dynamic-symbol=pncclGetVersion

-include $(DRILL_OBJS:.o=.d)

# r2cc-verbs-drill-direct: the same program linked against libibverbs (the software
# device's, found next to it), reaching verbs by symbol as HPC-X's net plugin does
# (verbs.c, DRILL_DIRECT); an interposer must meet it without dlvsym.
DRILL_DIRECT := $(BUILD)/bin/r2cc-verbs-drill-direct
DRILL_DIRECT_OBJS := $(filter-out $(DRILL_OBJ)/verbs.o,$(DRILL_OBJS)) $(DRILL_OBJ)/verbs_direct.o

$(DRILL_OBJ)/verbs_direct.o: $(DRILL_DIR)/verbs.c
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -DDRILL_DIRECT -MMD -MP -c -o $@ $<

$(DRILL_DIRECT): $(DRILL_DIRECT_OBJS) $(SV_LINK) $(SV_MLX5_LINK)
	@mkdir -p $(@D)
	$(CC) -o $@ $(DRILL_DIRECT_OBJS) -L$(SV_OUT) -libverbs -L$(SV_OUT)/mlx5 -lmlx5 \
	  -Wl,-rpath,'$$ORIGIN/../softverbs:$$ORIGIN/../softverbs/mlx5' \
	  -ldl -lm -pthread -Wl,--export-dynamic-symbol=pncclGetVersion

-include $(DRILL_OBJ)/verbs_direct.d

ALL_TARGETS += $(DRILL) $(DRILL_DIRECT)
FORMAT_SRCS += $(DRILL_SRCS) $(DRILL_DIR)/drill.h $(DRILL_DIR)/parent.h
