# tests/hook: R2CC_ON_INCIDENT (repair/hook.c) in the verbs drill's processes, NICs cut by
# R2CC_DRILL: a storm bounded by R2CC_ON_INCIDENT_MAX, the webhook and syslog examples
# (scripts/on-incident), a hanging and a failing command (tests/hook/run.sh).
TEST_DEPS += $(BUILD)/bin/r2cc-verbs-drill
CPU_TESTS += 120@tests/hook/run.sh:$(BUILD)
