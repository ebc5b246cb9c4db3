// Fixture: the session must not know the trainer.
#include "worker/agent/attempt_control.h"
#include "worker/train/trainer.h"
