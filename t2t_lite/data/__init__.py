"""Problems (in-process data generation) and the tf.data token-batching pipeline."""
