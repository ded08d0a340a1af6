"""Data preparation: fairseq's IWSLT'14 and WMT'14/'17 translation recipes without a Moses checkout,
offline when the archives are on disk, plus a small real German-English quickstart corpus (Ding).

Run ``python -m deepnmt_plugin.data RECIPE --help``, or the data-prep/prepare-*.sh front ends.
"""
