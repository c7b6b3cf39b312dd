"""The built site, as a reader's browser sees it: every page opens in headless
Chromium and renders its article; every link between pages, and every anchor
it names, exists; the landing page's screenshot is kept.

  python3 tools/check_site.py build/docs/html build/docs/landing.png

Chromium is Debian's chromium-headless-shell (.ci/docs installs it)."""
import html.parser
import os
import shutil
import subprocess
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    """A page's ids (anchors) and the links it makes."""

    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag in ("img", "script") and attrs.get("src"):
            self.links.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            self.links.append(attrs["href"])


def browser():
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    sys.exit("tools/check_site.py: no headless Chromium (apt-get install chromium-headless-shell)")


def render(chromium, path, *args):
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
             "--virtual-time-budget=3000"]
    return subprocess.run([chromium, *flags, *args, "file://" + os.path.abspath(path)],
                          capture_output=True, text=True, timeout=120)


def main(site, screenshot):
    chromium = browser()
    pages = sorted(os.path.relpath(os.path.join(d, f), site)
                   for d, _, files in os.walk(site) for f in files if f.endswith(".html")
                   and not d.startswith(os.path.join(site, "_")))
    parsed = {}
    for page in pages:
        parser = Page()
        with open(os.path.join(site, page)) as f:
            parser.feed(f.read())
        parsed[page] = parser
    failures = []
    for page, parser in parsed.items():
        for link in parser.links:
            url = urllib.parse.urlparse(link)
            if url.scheme or link.startswith("//"):
                continue  # the site makes no links out; the theme's are its own
            target = os.path.normpath(os.path.join(os.path.dirname(page), url.path)) \
                if url.path else page
            if not os.path.exists(os.path.join(site, target)):
                failures.append(f"{page}: links to {link}, which does not exist")
            elif url.fragment and target in parsed and url.fragment not in parsed[target].ids:
                failures.append(f"{page}: links to {link}, whose anchor is not on {target}")
    for page in pages:
        dom = render(chromium, os.path.join(site, page), "--dump-dom")
        # The search page fills its article in as it searches; it has the main column.
        wanted = "bd-main" if page in ("search.html", "genindex.html") else "bd-article"
        if dom.returncode != 0 or wanted not in dom.stdout:
            failures.append(f"{page}: Chromium did not render its article "
                            f"(exit {dom.returncode}): {dom.stderr.strip()[-300:]}")
    shot = render(chromium, os.path.join(site, "index.html"), "--window-size=1280,900",
                  f"--screenshot={os.path.abspath(screenshot)}")
    if shot.returncode != 0 or not os.path.exists(screenshot) or os.path.getsize(screenshot) < 10000:
        failures.append(f"index.html: no screenshot ({shot.stderr.strip()[-300:]})")
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"tools/check_site.py: {len(pages)} pages opened in {os.path.basename(chromium)}, "
          f"{sum(len(p.links) for p in parsed.values())} links checked, "
          f"{len(failures)} failures; landing page: {screenshot}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
