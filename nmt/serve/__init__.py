"""nmt-serve: trained models behind an HTTP API, and a page that shows their attention.

    models.py     a loaded checkpoint: its description (arch, attention variant, size, steps) and
                  translation of a list of lines into JSON-ready results (n-best, scores, attention)
    requests.py   the JSON body of POST /v1/translate checked field by field (4xx errors name the field)
    batcher.py    concurrent requests queued and decoded together, in one worker thread
    app.py        the Starlette app: /v1/translate, /v1/models, /health, and the page at /
    static/       the page: plain HTML, CSS and JavaScript, served as they are (no build step, no CDN)

The command is nmt/cli/serve.py (`nmt-serve checkpoint=RUN [compare=RUN]`).
"""
