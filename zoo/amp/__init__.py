"""Precision handling: device capability, the Amp component (autocast, O2, loss scaling)."""
from zoo.amp.amp import Amp, AmpConfigError, AmpUnsupportedError
from zoo.amp.capability import DeviceInfo, current_device

__all__ = ["Amp", "AmpConfigError", "AmpUnsupportedError", "DeviceInfo", "current_device"]
