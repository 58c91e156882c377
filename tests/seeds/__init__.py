"""The five source documents' code, as the documents show it (test fixtures, not library code).

Each ``docNNN.py`` follows its document line by line, including what the textbook classes leave out
(document 001's debugging prints, document 002's ``farward`` typo). Helpers a document uses without
showing (001's ``CausalAttention``, 004's d2l helpers) are their standard public form.
"""
