"""Precision handling: device capability, the Amp component (autocast, O2, loss scaling)."""
from zoo.amp.capability import DeviceInfo, current_device
from zoo.amp.policy import Amp, AmpConfigError, AmpUnsupportedError

__all__ = ["Amp", "AmpConfigError", "AmpUnsupportedError", "DeviceInfo", "current_device"]
