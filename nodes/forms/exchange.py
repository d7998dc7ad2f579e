"""The import form: a ``rankwise-profiles/1`` document as a file, as the export gives it."""

from __future__ import annotations

import json
from typing import Any

from django import forms


class ImportForm(forms.Form):
    """One JSON file of at most ``MAX_BYTES``; ``cleaned_data["document"]`` is what it holds."""

    MAX_BYTES = 8 * 2**20

    document = forms.FileField(
        label="Export file",
        help_text="A .json file from Export (format rankwise-profiles/1), at most 8 MiB.",
    )

    def clean_document(self) -> Any:
        upload = self.cleaned_data["document"]
        if upload.size > self.MAX_BYTES:
            raise forms.ValidationError(
                f"The file is {upload.size / 2**20:.1f} MiB; at most 8 MiB is read."
            )
        try:
            return json.loads(upload.read().decode("utf-8"))
        except UnicodeDecodeError:
            raise forms.ValidationError("The file is not text (UTF-8): not an export.") from None
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            raise forms.ValidationError(f"The file is not JSON: {str(exc)[:200]}") from None
