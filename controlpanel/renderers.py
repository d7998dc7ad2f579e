"""The one site-wide form renderer: every form and field renders through ``templates/forms/``."""

from __future__ import annotations

from django.forms.renderers import TemplatesSetting


class FormRenderer(TemplatesSetting):
    form_template_name = "forms/form.html"
    field_template_name = "forms/field.html"
