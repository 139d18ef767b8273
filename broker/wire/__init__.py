"""The native wire protocol, sans-IO: frames, field checks, codec, buffer, states, and the
``Connection`` object that turns bytes into frames and frames into bytes."""
