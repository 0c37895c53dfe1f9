"""Networks more than one family builds on (Wan: Wan, AnyFlow-FAR, Cosmos3; LTX-2: LTX-2, SANA-WM). A network only one family uses lives in that family's folder."""
