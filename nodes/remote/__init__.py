"""Programs Rankwise runs *on* nodes (sent over SSH on stdin); stdlib only, no Rankwise imports."""
