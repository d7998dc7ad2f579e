"""Form fields and widgets the feature forms share: strict ASCII numbers, sizes with their unit,
secrets that are never sent back to the browser."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from django import forms

from nodes.domain.units import ENTRY_UNITS, UnitError, shown_entry, to_bytes

_ASCII_INT = re.compile(r"[0-9]{1,15}")
_ASCII_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?")


class StrictIntegerField(forms.IntegerField):
    """Plain ASCII digits only: no exponents, underscores or other scripts' digits."""

    def to_python(self, value: Any) -> int | None:
        text = str(value).strip() if value is not None else ""
        if text and not _ASCII_INT.fullmatch(text.lstrip("-")):
            raise forms.ValidationError("Enter a whole number.", code="invalid")
        return super().to_python(text)


class StrictDecimalField(forms.DecimalField):
    """Plain ASCII decimal notation only (``96`` or ``141.5``), as the CLI accepts."""

    def to_python(self, value: Any) -> Decimal | None:  # type: ignore[override]
        text = str(value).strip() if value is not None else ""
        if text and not _ASCII_DECIMAL.fullmatch(text.lstrip("-")):
            raise forms.ValidationError("Enter a number such as 96 or 141.5.", code="invalid")
        return super().to_python(text)


class SizeWidget(forms.MultiWidget):
    """A number box and a GB/GiB choice, side by side."""

    template_name = "forms/size_widget.html"

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(
            [
                forms.NumberInput(attrs={"step": "any", "min": "0", "inputmode": "decimal"}),
                forms.Select(choices=[(unit, unit) for unit in ENTRY_UNITS]),
            ],
            attrs,
        )

    def decompress(self, value: int | None) -> list[Any]:
        if value is None:
            return [None, ENTRY_UNITS[0]]
        number, unit = shown_entry(value)  # rounded: the form keeps the exact bytes if unchanged
        return [number, unit]


class SizeField(forms.MultiValueField):
    """A memory size typed as a number plus an explicit unit (GB = 10^9 B, GiB = 2^30 B) → bytes."""

    widget = SizeWidget

    def __init__(self, **kwargs: Any) -> None:
        fields = (
            StrictDecimalField(min_value=Decimal(0), max_digits=24, decimal_places=9),
            forms.ChoiceField(choices=[(unit, unit) for unit in ENTRY_UNITS]),
        )
        super().__init__(fields, require_all_fields=True, **kwargs)

    def compress(self, data_list: list[Any]) -> int | None:
        if not data_list or data_list[0] is None:
            return None
        number, unit = data_list
        if unit not in ENTRY_UNITS:
            raise forms.ValidationError("Choose GB or GiB.")
        try:
            return to_bytes(number, unit)
        except UnitError as exc:
            raise forms.ValidationError(str(exc)) from None


class SecretTextarea(forms.Textarea):
    """A textarea that never sends its value back to the browser (like PasswordInput)."""

    def format_value(self, value: Any) -> str | None:
        return None
