"""From a file to samples to pieces: reading audio, the log-mel features, speech detection, cutting."""
