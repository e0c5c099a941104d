"""Byte-deterministic writers for the seeded input files (xlsx, docx, pptx, odt, png, jpeg).

Office libraries stamp the current time into docProps/core.xml and into every zip entry; we
rewrite the package with fixed timestamps and a fixed core.xml so that two builds are identical.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from xml.sax.saxutils import escape

FIXED_ZIP_TIME = (2024, 1, 1, 0, 0, 0)
FIXED_W3CDTF = "2024-01-01T00:00:00Z"

_CORE_XML = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
    '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/'
    'core-properties" xmlns:dc="http://purl.org/dc/elements/1.1/" '
    'xmlns:dcterms="http://purl.org/dc/terms/" xmlns:dcmitype="http://purl.org/dc/dcmitype/" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
    "<dc:title>{title}</dc:title><dc:creator>drums-tasks</dc:creator>"
    "<cp:lastModifiedBy>drums-tasks</cp:lastModifiedBy>"
    f'<dcterms:created xsi:type="dcterms:W3CDTF">{FIXED_W3CDTF}</dcterms:created>'
    f'<dcterms:modified xsi:type="dcterms:W3CDTF">{FIXED_W3CDTF}</dcterms:modified>'
    "</cp:coreProperties>"
)


def _zip_entries(entries: Iterable[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_TIME)
            info.create_system = 3
            info.external_attr = 0o644 << 16
            # ODF requires an uncompressed `mimetype` first; everything else is deflated.
            info.compress_type = zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED
            zf.writestr(info, data, compresslevel=6 if name != "mimetype" else None)
    return out.getvalue()


def normalize_ooxml(data: bytes, title: str = "") -> bytes:
    """Rewrite an OOXML package with fixed zip times and a fixed core.xml."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        entries = []
        for info in zf.infolist():
            body = zf.read(info.filename)
            if info.filename == "docProps/core.xml":
                body = _CORE_XML.format(title=escape(title)).encode()
            entries.append((info.filename, body))
    return _zip_entries(entries)


def xlsx_bytes(workbook) -> bytes:  # openpyxl.Workbook
    buf = io.BytesIO()
    workbook.save(buf)
    return normalize_ooxml(buf.getvalue())


def docx_bytes(document) -> bytes:  # docx.Document
    buf = io.BytesIO()
    document.save(buf)
    return normalize_ooxml(buf.getvalue())


def pptx_bytes(presentation) -> bytes:  # pptx.Presentation
    buf = io.BytesIO()
    presentation.save(buf)
    return normalize_ooxml(buf.getvalue())


_ODF_NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
    'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"'
)


def odt_bytes(paragraphs: list[str], heading: str | None = None) -> bytes:
    """A minimal valid ODF text document: one optional heading, then plain paragraphs."""
    body = ""
    if heading is not None:
        body += f'<text:h text:outline-level="1">{escape(heading)}</text:h>'
    body += "".join(f"<text:p>{escape(p)}</text:p>" for p in paragraphs)
    content = (
        f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {_ODF_NS} '
        f'office:version="1.2"><office:body><office:text>{body}</office:text></office:body>'
        "</office:document-content>"
    )
    styles = (
        f'<?xml version="1.0" encoding="UTF-8"?><office:document-styles {_ODF_NS} '
        'office:version="1.2"/>'
    )
    manifest = (
        '<?xml version="1.0" encoding="UTF-8"?><manifest:manifest '
        'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" '
        'manifest:version="1.2">'
        '<manifest:file-entry manifest:full-path="/" manifest:version="1.2" '
        'manifest:media-type="application/vnd.oasis.opendocument.text"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
        '<manifest:file-entry manifest:full-path="styles.xml" manifest:media-type="text/xml"/>'
        "</manifest:manifest>"
    )
    return _zip_entries(
        [
            ("mimetype", b"application/vnd.oasis.opendocument.text"),
            ("content.xml", content.encode()),
            ("styles.xml", styles.encode()),
            ("META-INF/manifest.xml", manifest.encode()),
        ]
    )


def image_bytes(image, fmt: str = "PNG") -> bytes:  # PIL.Image.Image
    """PNG/JPEG without metadata chunks (Pillow writes none unless asked), so bytes are stable."""
    buf = io.BytesIO()
    if fmt == "JPEG":
        image.save(buf, "JPEG", quality=92, optimize=False)
    else:
        image.save(buf, "PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def odp_bytes(slides: list[list[str]]) -> bytes:
    """A minimal ODF presentation: one page per entry, each line a text box paragraph."""
    ns = (
        f'{_ODF_NS} xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
        'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0"'
    )
    pages = ""
    for i, lines in enumerate(slides):
        boxes = "".join(
            f'<draw:frame svg:x="1cm" svg:y="{2 + 3 * j}cm" svg:width="20cm" svg:height="2cm">'
            f"<draw:text-box><text:p>{escape(line)}</text:p></draw:text-box></draw:frame>"
            for j, line in enumerate(lines)
        )
        pages += f'<draw:page draw:name="page{i + 1}">{boxes}</draw:page>'
    content = (
        f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {ns} '
        f'office:version="1.2"><office:body><office:presentation>{pages}</office:presentation>'
        "</office:body></office:document-content>"
    )
    mime = "application/vnd.oasis.opendocument.presentation"
    manifest = (
        '<?xml version="1.0" encoding="UTF-8"?><manifest:manifest '
        'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" '
        'manifest:version="1.2">'
        f'<manifest:file-entry manifest:full-path="/" manifest:version="1.2" '
        f'manifest:media-type="{mime}"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
        "</manifest:manifest>"
    )
    return _zip_entries(
        [
            ("mimetype", mime.encode()),
            ("content.xml", content.encode()),
            ("META-INF/manifest.xml", manifest.encode()),
        ]
    )
