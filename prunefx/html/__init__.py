"""The HTML view: the self-contained graph page (``page``), its layered layout (``layout``) and its assets."""
