"""`trnf profile`: where a training step's time goes, what it achieves against the device's
peak, and what that throughput buys within the budget."""
