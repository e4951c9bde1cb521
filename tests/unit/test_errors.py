from verl_grpo.errors import ConfigError, DataError, InfraError, Preempted, TrainingError, error_class, is_retryable


def test_retry_is_decided_by_type():
    assert is_retryable(InfraError("x")) and is_retryable(Preempted("x"))
    assert not any(is_retryable(e("x")) for e in (ConfigError, DataError, TrainingError))
    assert not is_retryable(ValueError("preempted"))  # message text never decides


def test_error_class_by_reported_name():
    assert error_class("DataError") is DataError and error_class("Preempted") is Preempted
    assert error_class(None) is TrainingError and error_class("KeyError") is TrainingError
