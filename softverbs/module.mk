# softverbs: the software RDMA device (see softverbs/README.md); its tests are in
# softverbs/module.mk.
#   $(BUILD)/softverbs/libibverbs.so.1 (+ libibverbs.so)  the device, soname libibverbs.so.1
#   $(BUILD)/bin/softverbs-ctl                            fabric listing and fault injection
#   $(BUILD)/bin/softverbs-bw                             its bandwidth and latency benchmark
#   $(BUILD)/bin/softverbs-pieces                         the kernel's cost of word-by-word landing
#   $(BUILD)/bin/softverbs-limits                         each reported limit against what is accepted

SV_DIR   := softverbs
SV_OUT   := $(BUILD)/softverbs
SV_OBJ   := $(SV_OUT)/obj
SV_LIB   := $(SV_OUT)/libibverbs.so.1
SV_LINK  := $(SV_OUT)/libibverbs.so
SV_CTL   := $(BUILD)/bin/softverbs-ctl
SV_BW    := $(BUILD)/bin/softverbs-bw
SV_PIECES := $(BUILD)/bin/softverbs-pieces
SV_LIMITS := $(BUILD)/bin/softverbs-limits

SV_LIB_OBJS := $(SV_OBJ)/fabric.o $(SV_OBJ)/roce.o $(SV_OBJ)/device.o $(SV_OBJ)/cq.o \
               $(SV_OBJ)/qp.o $(SV_OBJ)/post.o $(SV_OBJ)/exec.o $(SV_OBJ)/engine.o \
               $(SV_OBJ)/srq.o $(SV_OBJ)/compat.o $(SV_OBJ)/devmem.o
SV_CFLAGS   := $(BIN_CFLAGS) -fvisibility=hidden

$(SV_OBJ)/%.o: $(SV_DIR)/%.c
	@mkdir -p $(@D)
	$(CC) $(SV_CFLAGS) -MMD -MP -c -o $@ $<

$(SV_LIB): $(SV_LIB_OBJS) $(SV_DIR)/libibverbs.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $(SV_LIB_OBJS) -Wl,-soname,libibverbs.so.1 \
	  -Wl,--version-script=$(SV_DIR)/libibverbs.map -Wl,-z,defs -pthread

$(SV_LINK): $(SV_LIB)
	ln -sf libibverbs.so.1 $@

# libmlx5.so.1 (+ libmlx5.so): the mlx5 Direct Verbs stand-in (mlx5.c), on the device.
# A folder of its own, put on LD_LIBRARY_PATH only where wanted: rdma-core's programs
# (perftest, pyverbs) link Debian's libmlx5 for far more than it has.
SV_MLX5 := $(SV_OUT)/mlx5/libmlx5.so.1
SV_MLX5_LINK := $(SV_OUT)/mlx5/libmlx5.so

$(SV_MLX5): $(SV_OBJ)/mlx5.o $(SV_DIR)/libmlx5.map $(SV_LINK)
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $(SV_OBJ)/mlx5.o -Wl,-soname,libmlx5.so.1 \
	  -Wl,--version-script=$(SV_DIR)/libmlx5.map -Wl,-z,defs -L$(SV_OUT) -libverbs \
	  -Wl,-rpath,'$$ORIGIN/..'

$(SV_MLX5_LINK): $(SV_MLX5)
	ln -sf libmlx5.so.1 $@

$(SV_CTL): $(SV_OBJ)/ctl.o $(SV_OBJ)/fabric.o $(SV_OBJ)/roce.o
	@mkdir -p $(@D)
	$(CC) -o $@ $^ -pthread

$(SV_BW): $(SV_OBJ)/bw.o $(SV_LINK)
	@mkdir -p $(@D)
	$(CC) -o $@ $(SV_OBJ)/bw.o -L$(SV_OUT) -libverbs -Wl,-rpath,'$$ORIGIN/../softverbs' -pthread

$(SV_LIMITS): $(SV_OBJ)/limits.o $(SV_LINK)
	@mkdir -p $(@D)
	$(CC) -o $@ $(SV_OBJ)/limits.o -L$(SV_OUT) -libverbs -Wl,-rpath,'$$ORIGIN/../softverbs'

$(SV_PIECES): $(SV_OBJ)/pieces.o
	@mkdir -p $(@D)
	$(CC) -o $@ $<

-include $(SV_OBJ)/*.d

ALL_TARGETS += $(SV_LIB) $(SV_LINK) $(SV_MLX5) $(SV_MLX5_LINK) $(SV_CTL) $(SV_BW) $(SV_PIECES) $(SV_LIMITS)
FORMAT_SRCS += $(wildcard $(SV_DIR)/*.c $(SV_DIR)/*.h)
